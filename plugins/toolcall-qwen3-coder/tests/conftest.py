"""The distribution's tests import their shared fixtures module from this folder."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
