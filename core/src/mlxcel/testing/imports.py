"""What a fresh interpreter imports: for tests that keep heavy or optional modules off a
path (an entry point, serving without a schema), which a test process cannot check since
it has imported everything already."""

from __future__ import annotations


def imported_by(statement: str, modules: tuple[str, ...]) -> list[str]:
    """Those of ``modules`` that a fresh interpreter has imported after ``statement``."""
    import json
    import subprocess
    import sys

    code = (f"import json, sys\n{statement}\n"
            f"print(json.dumps([m for m in {list(modules)!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])
