"""The compile pipeline every frontend uses and none owns: FX graph → Plan → NEFF → CompiledGraph.

* :mod:`.plan`: the output template, the FX passes and lowering (HLO cache) of one graph, as a :class:`Plan`.
* :mod:`.lowering`: lowering through the HLO cache, writing the artifact tree.
* :mod:`.neffs`: the NEFF of a plan: cache key, NEFF cache, the compiler driver on a miss.
* :mod:`.graph`: :class:`CompiledGraph`, the callable that runs a plan's NEFF.
* :mod:`.trace`: tracing a Python function (an eager op, a user kernel) to a plan, and the stored trace.
* :mod:`.artifacts`: the job artifact tree.

The torch.compile frontend (``dynamo/``), the eager device (``device/``) and user kernels
(``kernels/``) sit above it and never import each other.
"""
