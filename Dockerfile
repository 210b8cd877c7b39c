# jobq API image. The same image runs migrations (`jobq migrate`), the API (`jobq serve`)
# and the example worker. Installed editable from the checkout so `alembic/` ships with it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /srv/jobq

COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY jobq_client ./jobq_client
COPY alembic ./alembic
COPY examples ./examples
RUN pip install -e . && useradd --system --uid 10001 jobq
USER jobq

EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/readyz').status == 200 else 1)"
CMD ["jobq", "serve", "--host", "0.0.0.0", "--port", "8000"]
