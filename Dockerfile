# Build: docker build -t kvroute .
# Run:   docker run --rm --network llm -p 8080:8080 -p 127.0.0.1:9090:9090 \
#          -v "$PWD/deploy/docker:/etc/kvroute:ro" kvroute
# The container listens on 0.0.0.0:8080 (proxy) and 0.0.0.0:9090 (admin) via
# the environment below; the mounted directory's config.yaml supplies the
# backends (deploy/docker/config.yaml names vLLM containers on the network
# "llm"). Mount the directory, not the file: kvroute watches it, and an
# editor's save by rename is then seen in the container.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath \
      -ldflags "-s -w -X github.com/kvroute/kvroute/cli.Version=${VERSION}" \
      -o /out/kvroute .

RUN echo 'kvroute:x:65532:65532:kvroute:/:/sbin/nologin' > /out/passwd

# Static binary on an empty base, running as an unprivileged user.
FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/passwd /etc/passwd
COPY --from=build /out/kvroute /usr/local/bin/kvroute
USER 65532:65532
ENV KVROUTE_LISTEN=0.0.0.0:8080 KVROUTE_ADMIN_LISTEN=0.0.0.0:9090
EXPOSE 8080 9090 6222
ENTRYPOINT ["/usr/local/bin/kvroute", "serve", "--config", "/etc/kvroute/config.yaml"]
