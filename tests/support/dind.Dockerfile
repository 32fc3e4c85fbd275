# The docker-in-docker engine of tests/support/dind_engine.py: Debian's dockerd on the local base.
# Built with BuildKit: the host's CA bundle is a secret mount for the apt step only (apt reaches
# Debian's archive through a TLS-intercepting proxy here), so it is in no layer.
ARG BASE=envbuild/base:bookworm
FROM ${BASE}
# hadolint ignore=DL3008
RUN --mount=type=secret,id=ca \
    apt-get -o Acquire::https::CaInfo=/run/secrets/ca update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::https::CaInfo=/run/secrets/ca \
      install -y -qq --no-install-recommends docker.io iptables ca-certificates >/dev/null \
 && rm -rf /var/lib/apt/lists/*
EXPOSE 2376
ENTRYPOINT ["dockerd"]
