# No "# syntax=" line: it makes BuildKit pull a frontend image, which fails offline or
# behind a registry mirror. The frontend built into Docker (20.10+) has all this uses.
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[bedrock,vertex]"

FROM python:3.12-slim
RUN useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin gateway
# The wheels are bind-mounted for this one RUN, not copied: a COPY is a layer of its own,
# so the wheels would stay in the image even after an "rm" in a later RUN. --mount needs
# BuildKit: Docker's default builder since 23.0, and what docker compose build uses (the
# legacy builder, DOCKER_BUILDKIT=0, refuses this line).
# --no-index: everything comes from the build stage, nothing from the network.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels /wheels/*.whl
USER gateway
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status != 200)"]
ENTRYPOINT ["resumable-gateway"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
