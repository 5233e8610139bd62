"""Gymnasium environments around the speculative decoding loop (installed as ``specrl.envs``)."""
