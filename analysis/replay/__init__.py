"""Replay of serving engines' routing traces (vLLM, SGLang, a plain long table) against the
reference model as transformers runs it: the readers (`trace`), the broken-trace checks (`checks`)."""
