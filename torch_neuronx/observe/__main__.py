"""``python -m torch_neuronx.observe [--markdown]``: list every registered metric and event name."""

import sys

from torch_neuronx.observe import names

if "--markdown" in sys.argv[1:]:
    print(names.render_markdown())
else:
    for m in names.metrics():
        print(f"{m.name:40} {m.kind:8} {m.unit:6} {m.doc}")
