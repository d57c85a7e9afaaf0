"""Driving the explorer with Streamlit's AppTest, as the app tests share it."""
from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from routescope.app import state as K

APP = str(Path(__file__).resolve().parents[1] / "app" / "main.py")


def fresh(timeout: float = 240) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=timeout)
    at.run()
    return at


def pick(at: AppTest, name: str) -> AppTest:
    box = at.selectbox(key=K.CHECKPOINT)
    box.set_value(next(p for p in box.options if Path(p).name == name)).run()
    return at


def view(at: AppTest, name: str) -> AppTest:
    at.segmented_control(key=K.VIEW).set_value(name).run()
    return at
