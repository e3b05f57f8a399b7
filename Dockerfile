# The demo project as a web process. Production hosts add llm_budgets to their own image instead.
FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY llm_budgets ./llm_budgets
RUN pip install --no-cache-dir ".[postgres,celery-beat]" "redis>=5" gunicorn
COPY manage.py ./
COPY project ./project
COPY demo ./demo
COPY templates ./templates
EXPOSE 8000
# Threaded workers and a deadline on request bodies, so slow clients cannot stall the API
# (project/gunicorn.conf.py; WEB_CONCURRENCY, GUNICORN_THREADS, REQUEST_BODY_TIMEOUT).
CMD ["gunicorn", "-c", "project/gunicorn.conf.py", "project.wsgi:application"]
