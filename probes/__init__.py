"""Adversarial and long-running checks against a running gateway: the abuse probes
(``python -m probes.abuse``), the chaos soak (``python -m probes.soak``) and the nemesis
(``python -m probes.nemesis``), the last two reading their streams with one client
(``probes.stream``). Not measurements: each ends in a verdict, pass or fail (``bench/``
holds the measurements)."""
