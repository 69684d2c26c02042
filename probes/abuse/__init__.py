"""The abuse suite: ``python -m probes.abuse`` (see its ``__main__``)."""
