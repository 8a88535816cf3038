"""``python -m torch_neuronx.config``: print every variable's effective value and its source."""

from torch_neuronx.config import main

raise SystemExit(main())
