"""The run engine: one run over its legs (``run``, ``attempts``), and what keeps it going
past its client (``durable``, ``log``), across replicas (``resume``, ``registry``,
``aliases``). Protocols reach it only as adapters (``gateway.protocols``)."""
