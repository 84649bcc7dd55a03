# torchyard service image. pip brings torch's CUDA wheels (the NVIDIA driver comes from the host via the
# NVIDIA container toolkit); the server itself never
# imports torch, the ranks it launches do.
FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 TORCHYARD_HOME=/data TORCHYARD_HOST=0.0.0.0 TORCHYARD_PORT=8000
WORKDIR /app
COPY pyproject.toml README.md ./
COPY service ./service
COPY worker ./worker
COPY migrations ./migrations
RUN pip install .
VOLUME /data
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz')"
CMD ["torchyard", "serve"]
