"""File formats shared by the compiler, the caches and the runtime, importing none of them.

:mod:`.neff` is the NEFF container (header, payload, verification); :mod:`.parameters`
names the resident parameters a NEFF declares and the runtime binds.
"""
