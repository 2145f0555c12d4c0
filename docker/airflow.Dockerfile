# The Airflow image of docker-compose.yaml: the official Apache Airflow 3 image with this package
# installed from the repository, and a Java runtime so spark-submit (shipped by the full pyspark
# that the package pins) runs in client mode. The Spark worker runs from this image too, so its
# executors have the same Python (version and path) as the driver in the scheduler container.
#
# Build context: the repository root (docker-compose.yaml sets it), e.g.
#   docker build -f docker/airflow.Dockerfile -t airflow-pglogrepl:local .
ARG AIRFLOW_IMAGE=apache/airflow:3.3.2-python3.11
FROM ${AIRFLOW_IMAGE}

USER root
# default-jre-headless is Java 17 on Debian bookworm (21 on trixie); Spark 4 runs on both.
# /usr/share/man/man1 is missing in slim images and the JRE's post-install script needs it.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends default-jre-headless procps \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /opt/airflow/lake /opt/airflow/auth /opt/pglogrepl \
    && chown -R airflow:0 /opt/airflow/lake /opt/airflow/auth /opt/pglogrepl
ENV JAVA_HOME=/usr/lib/jvm/default-java

USER airflow
# Only what the package build needs: edits to tests or docs do not invalidate this layer.
COPY --chown=airflow:0 pyproject.toml README.md /opt/pglogrepl/
COPY --chown=airflow:0 airflow_pglogrepl /opt/pglogrepl/airflow_pglogrepl
# Pinning apache-airflow to the image's own version keeps pip from upgrading Airflow itself; the
# package's pins (pyspark and pyspark-client at one release) come from pyproject.toml.
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" /opt/pglogrepl \
    && spark-submit --version \
    && airflow providers list | grep -q airflow-pglogrepl
