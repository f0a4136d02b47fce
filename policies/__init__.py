"""A tenant's Cedar policy sets: versioned, evaluated by the gateway (docs/policies.md).

Sits below ``tasks`` (docs/style.md R1): it imports ``portal`` and ``audit`` only. The
gateway builds a ``engine.PolicyRequest`` from what it knows and asks
``engine.evaluate``; the console feeds the what-if from stored operations.
"""
