"""The distribution's tests import their shared fixtures module, ``qwen3_coder_fixtures``, from
this folder (a name of its own, so that several distributions' tests run in one pytest)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
