"""Hardware profiles: what a step costs on this machine with this model pair.

``load_profile(path)`` reads and validates one; ``check_compatible(profile, fingerprint)``
refuses a profile measured on other hardware or another model pair; ``measure_profile``
(in :mod:`specrl.profile.measure`) measures one with the real engine.
"""

from specrl.profile.fingerprint import (
    check_compatible,
    device_name,
    pair_fingerprint,
    use_profile_threads,
)
from specrl.profile.schema import Profile, load_profile, profile_from_json

__all__ = [
    "Profile",
    "check_compatible",
    "device_name",
    "load_profile",
    "pair_fingerprint",
    "profile_from_json",
    "use_profile_threads",
]
