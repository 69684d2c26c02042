"""The configuration: its schema (``schema``) and how it is read (``load``)."""
