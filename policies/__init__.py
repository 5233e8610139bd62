"""PPO and the baseline K controllers (installed as ``specrl.policies``)."""

from specrl.policies.fixed import BatchThreshold, FixedK

__all__ = ["BatchThreshold", "FixedK"]
