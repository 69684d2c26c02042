"""The chaos soak: ``python -m probes.soak`` (see its ``__main__``)."""
