"""How the API spells a MIG profile name, independent of which GPU model resolves it.

Names are device-relative (``1g.10gb`` differs between A100-40GB and H100-80GB), so the
API only checks the spelling; :mod:`tessera.mig.catalog` resolves names per model.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

# <C>c.<G>g.<GB>gb with the C part dropped when C == G, and one optional attribute:
# +me (media extensions), +me.all, +gfx, -me (go-nvlib's mig_profile.go).
PROFILE_NAME_PATTERN = r"^([1-8]c\.)?[1-8]g\.[1-9][0-9]{0,3}gb(\+me|\+me\.all|\+gfx|-me)?$"
PROFILE_NAME_MAX_LENGTH = 32

ProfileName = Annotated[
    str, Field(pattern=PROFILE_NAME_PATTERN, max_length=PROFILE_NAME_MAX_LENGTH)
]
