"""A seeded nemesis against gateway replicas on a replicated Redis (issue 40): see
``probes.nemesis.__main__``."""
