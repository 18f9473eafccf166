# postbox: a static binary on a distroless base, running as non-root.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X github.com/postbox-relay/postbox/relay.Version=${VERSION}" \
      -o /out/postbox ./cmd/postbox

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/postbox /usr/local/bin/postbox
USER nonroot:nonroot
# The admin listener (metrics, health) binds to loopback unless configured.
EXPOSE 9187
ENTRYPOINT ["/usr/local/bin/postbox"]
CMD ["run"]
