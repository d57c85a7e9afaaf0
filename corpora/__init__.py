"""The project's synthetic training text: TinyStories-like stories (`stories`, the `story_plots_*`
templates, `lexicon`) and OpenMathInstruct-like math problems (`math_problems`,
`math_word_problems`), streamed deterministically by `corpus`. Nothing here knows of models."""

from routescope.layout import only_as  # noqa: E402

only_as("routescope.corpora", __name__)
