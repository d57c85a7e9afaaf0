"""A family from outside the repository: a tiny plugin package, installed with pip into a venv of its
own, registers its FamilySpec through the `routescope.families` entry point. Python (`rs`), the
command line and the app then find its presets, views, drawer and page without any edit to
RouteScope; this test's own environment never sees the plugin."""
from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = '''
"""A routed family of two 'lane' layers: x + sum_j w_j lane_j(x), w = softmax(gate(x)) over its lanes."""
from dataclasses import dataclass

import torch
from torch import nn

from routescope.analysis.runs import views as A
from routescope.core_models.base import RouteScopeLM
from routescope.core_models.config import BaseConfig
from routescope.core_models.sites import RoutingLayer, Site
from routescope.families import FamilySpec, Page


@dataclass(frozen=True)
class LanesConfig(BaseConfig):
    family = "lanes"
    vocab_size: int = 4096
    d_model: int = 16
    n_lanes: int = 3
    context: int = 64


class Lane(RoutingLayer):
    option_noun = "lane"

    def __init__(self, d, n):
        super().__init__()
        self.n_options = n
        self.gate = nn.Linear(d, n)
        self.lanes = nn.ModuleList(nn.Linear(d, d) for _ in range(n))
        self.option_weights = Site("[batch, pos, n_options] softmax weight of each lane (0 where dropped)")

    def forward(self, x):
        mask = torch.tensor([j in self.dropped() for j in range(self.n_options)])
        w = self.option_weights(torch.softmax(self.gate(x).masked_fill(mask, float("-inf")), dim=-1))
        return x + sum(w[..., j:j + 1] * lane(x) for j, lane in enumerate(self.lanes))


class Lanes(RouteScopeLM):
    def __init__(self, c):
        super().__init__()
        self.config, self.context, self.vocab_size = c, c.context, c.vocab_size
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList(Lane(c.d_model, c.n_lanes) for _ in range(2))
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self._finalize()

    def _forward(self, idx):
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def count(c):
    d, n = c.d_model, c.n_lanes
    return 2 * c.vocab_size * d + 2 * (d * n + n + n * (d * d + d))


def views(trace, model, **kw):
    base = A.GENERIC.views(trace, model, **kw)
    w = base["options"].frame
    top = w[w["selected"]].groupby("layer", sort=False).size().rename("tokens").reset_index()
    return {**base, "lane_tokens": A.View(top, A.FAMILY)}


def draw_tokens(name, view, ctx):
    from routescope.rendering import bar_figures as BF

    return {name: BF.bar_figure(list(view.frame["layer"]), list(view.frame["tokens"]), "Lane plugin: tokens per layer")}


def lanes_page(model, path, mtime, ablation, described):
    import streamlit as st

    st.markdown(f"Lanes page for {model.config.n_lanes} lanes")


SPEC = FamilySpec("lanes", LanesConfig, Lanes, count, A.FamilyAnalysis(views=views, export=A.GENERIC.export),
                  drawers={"lane_tokens": draw_tokens}, pages=(Page("Lanes", lanes_page),),
                  presets={"lanes-tiny": {"n_lanes": 3}})
'''

PYPROJECT = '''
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "routescope-lanes"
version = "0.1"

[project.entry-points."routescope.families"]
lanes = "routescope_lanes:SPEC"

[tool.setuptools]
py-modules = ["routescope_lanes"]
'''

# run in the plugin's venv: rs, the command line and the app, each finding the family by itself
SCRIPT = '''
import json, sys
from pathlib import Path

import routescope as rs
from routescope import families
from routescope.cli.main import main
from tokenizers import Tokenizer

work = Path(sys.argv[1])
out = {"families": families.names()}
model = rs.build_model(rs.from_name("lanes-tiny")).eval()
ck = rs.save(model, work / "cks" / "lanes-ck", tokenizer=Tokenizer.from_file(sys.argv[2]))
model, tok = rs.load(ck)
run = rs.run(model, tok, "Once upon a time", max_new_tokens=2, drop=["layers.0:1"])
out["views"] = list(run.views)
out["figures"] = sorted(rs.figures(run, model))
out["export_rc"] = main(["export", str(ck), "--prompt", "Once upon a time", "--out", str(work / "x.csv"), "--quiet"])
out["family_column"] = sorted(set(rs.read_csv(work / "x.csv")["family"]))

from streamlit.testing.v1 import AppTest
from routescope.app import state as K

at = AppTest.from_file(sys.argv[3], default_timeout=120)
at.run()
at.selectbox(key=K.CHECKPOINT).set_value(str(ck)).run()
out["app_views"] = list(at.segmented_control(key=K.VIEW).options)
at.segmented_control(key=K.VIEW).set_value("Routing").run()
out["app_errors"] = [str(e.value) for e in [*at.exception, *at.error]]
out["app_figures"] = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
at.segmented_control(key=K.VIEW).set_value("Lanes").run()
out["page"] = [m.value for m in at.markdown if "Lanes page" in m.value]
print("RESULT " + json.dumps(out))
'''


@pytest.mark.slow
def test_a_plugin_family_is_found_by_rs_the_cli_and_the_app(tmp_path):
    from routescope import families

    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "routescope_lanes.py").write_text(textwrap.dedent(PLUGIN))
    (plugin / "pyproject.toml").write_text(textwrap.dedent(PYPROJECT))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # the new venv sees this environment's packages (RouteScope, torch, Streamlit, pip) behind its own
    (site / "parent_env.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--disable-pip-version-check", str(plugin)], check=True, timeout=300)
    tokenizer = next(ROOT.glob("checkpoints/*/tokenizer.json"))
    done = subprocess.run([str(py), "-c", SCRIPT, str(tmp_path), str(tokenizer), str(ROOT / "app" / "main.py")],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "ROUTESCOPE_CHECKPOINTS": str(tmp_path / "cks"),
                               "HOME": str(tmp_path)})
    line = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
    assert done.returncode == 0 and line, done.stderr[-3000:]
    out = json.loads(line[0].removeprefix("RESULT "))
    assert out["families"][-1] == "lanes" and "papaformer" in out["families"]
    assert out["views"] == ["options", "lane_tokens"]
    assert "lane_tokens" in out["figures"]
    assert out["export_rc"] == 0 and out["family_column"] == ["lanes"]
    assert out["app_errors"] == []
    assert "Lanes" in out["app_views"] and "Table 6" not in out["app_views"]  # its page, not PaPaformer's
    assert "Lane plugin: tokens per layer" in out["app_figures"]
    assert out["page"] == ["Lanes page for 3 lanes"]
    assert "lanes" not in families.names()  # this environment never saw the plugin


def test_a_broken_plugin_is_named_in_one_line_when_its_family_is_asked_for(monkeypatch):
    from importlib import metadata

    from routescope import families
    from routescope.core_models import plugins
    from routescope.core_models.config import ConfigError

    eps = metadata.EntryPoints([
        metadata.EntryPoint("broken", "no_such_module_xyz:SPEC", families.ENTRY_POINTS),
        metadata.EntryPoint("papaformer", "no_such_module_xyz:SPEC", families.ENTRY_POINTS),  # never replaces
    ])
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: eps if group == families.ENTRY_POINTS else [])
    monkeypatch.setattr(plugins, "_loaded", False)
    monkeypatch.setattr(plugins, "_broken", {})
    monkeypatch.setattr(plugins, "_found", {})
    assert families.spec("papaformer") in families.BUILTIN
    with pytest.raises(ConfigError, match=r"^family 'broken': its plugin did not load \(no_such_module_xyz:SPEC: "
                                          r"ModuleNotFoundError"):
        families.spec("broken")
    with pytest.raises(ConfigError, match="family = 'nope': unknown; known families: llama, papaformer"):
        families.spec("nope")
