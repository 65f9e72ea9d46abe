"""Studies as stored things: storage URLs and the storages they open (`storage`; every call's
failure said in one line by `guarded`, which `storage_errors` names), the studies a storage
holds (`catalog`), opening, resuming and checking a study (`lifecycle`), one trial read
back as a typed record (`record`), the leaders and their confirmation runs (`leaders`), and a
study summarized (`summary`). Torch-free: `show`, `compare`, `report` and `export --study` read
studies through this package, and so does the tuner."""

from __future__ import annotations
