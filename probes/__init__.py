"""Adversarial and long-running checks against a running gateway: the abuse probes
(``python -m probes.abuse``) and the chaos soak (``python -m probes.soak``). Not
measurements: each ends in a verdict, pass or fail (``bench/`` holds the measurements)."""
