"""PPO and the baseline K controllers (installed as ``specrl.policies``)."""
