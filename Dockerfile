# torchyard service image. pip brings torch's CUDA wheels; the NVIDIA driver (and nvidia-smi) come
# from the host through the NVIDIA container toolkit. The server itself never imports torch; the
# ranks it launches do. The dashboard's plotly.js is inside the plotly wheel: no network at run time.
FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 \
    TORCHYARD_HOME=/data TORCHYARD_HOST=0.0.0.0 TORCHYARD_PORT=8000
WORKDIR /app
COPY pyproject.toml README.md constraints.txt ./
COPY service ./service
COPY worker ./worker
COPY migrations ./migrations
# The tested set of every dependency (docs/dependencies.md), as the README's set-up uses.
RUN pip install . -c constraints.txt && cd / \
 && python -c "import pathlib, plotly; assert (pathlib.Path(plotly.__file__).parent / 'package_data' / 'plotly.min.js').is_file()" \
 && python -c "import service, pathlib; assert (pathlib.Path(service.__file__).parent / 'dashboard' / 'index.html').is_file()"
# An unprivileged user owns the data volume (a new named volume copies this ownership).
RUN useradd --create-home --uid 1000 torchyard && mkdir -p /data && chown torchyard /data
USER torchyard
VOLUME /data
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --retries=3 --start-period=20s \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"
CMD ["torchyard", "serve"]
