"""The docs' pictures, made from the code so they cannot drift from it (issue 41).

    .venv/bin/python -m pictures            # or scripts/docs-pictures: every picture
    .venv/bin/python -m pictures demo       # only the demo's terminal output
    .venv/bin/python -m pictures dashboard  # only the Grafana dashboard

Each writes SVG into ``docs/pictures/``, committed with the pages that show them:

- ``demo`` (``pictures.demo``): scenes of ``resumable-gateway demo``, run here as the
  command runs them and drawn as the terminal shows them (``pictures.terminal``): its
  real-model scene (``demo-real-model.svg``, the front page; it needs the real model,
  ``scripts/install`` puts it in ``.venv/models``) and three chaos scenes (``demo.svg``);
- ``dashboard`` (``pictures.dashboard``): the panels of
  ``deploy/grafana/dashboards/resumable-gateway.json``, each query evaluated
  (``pictures.promql``) over scrapes of a real gateway's ``/metrics`` while faulted
  streams go through it (``pictures.traffic``), and drawn as Grafana lays them out
  (``pictures.panels``).

No Docker, Prometheus or Grafana needed; plain SVG written by hand, no drawing library.
"""
