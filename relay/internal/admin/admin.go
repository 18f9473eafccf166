// Package admin is postbox's admin listener: Prometheus metrics, liveness
// and readiness probes, the health summary as JSON, and the console's
// pages at every other path.
//
// It binds to loopback by default. Bound elsewhere it needs a token. With a
// token, /metrics, /readyz and /status require "Authorization: Bearer
// <token>"; /healthz never does; the console checks its own requests (see
// package console). With a certificate (TLS) it speaks HTTPS only.
package admin

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// Checks are the questions the admin listener asks the relay.
type Checks struct {
	// Ready returns nil when the relay is ready: database reachable, the
	// slot streamed by this or another instance, not lagging too far.
	Ready func(ctx context.Context) error
	// Status returns the health summary.
	Status func(ctx context.Context) (any, error)
}

// Server is the admin HTTP server.
type Server struct {
	srv *http.Server
	ln  net.Listener
	tls *TLS
	log zerolog.Logger
}

// TLS is the admin listener's certificate. Reload swaps it whole, so a
// handshake sees the old pair or the new one, never half of each; the
// connections already open keep theirs.
type TLS struct {
	cert atomic.Pointer[tls.Certificate]
}

// LoadTLS reads a PEM certificate (chain) and its key.
func LoadTLS(certFile, keyFile string) (*TLS, error) {
	t := &TLS{}
	if err := t.Reload(certFile, keyFile); err != nil {
		return nil, err
	}
	return t, nil
}

// Reload reads the pair again (a rotated certificate, on SIGHUP); on an
// error the certificate in use stays.
func (t *TLS) Reload(certFile, keyFile string) error {
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return err
	}
	t.cert.Store(&c)
	return nil
}

func (t *TLS) config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return t.cert.Load(), nil
		},
	}
}

// ErrTokenRequired refuses a non-loopback listener without a token.
var ErrTokenRequired = errors.New("admin: admin_token is required when admin_listen is not a loopback address")

// Listen binds addr now, so a taken port fails at start, not later.
// console, when not nil, serves every path the listener does not. token
// is asked on every request, so a reloaded admin_token applies at once
// and the old one stops working. certs, when not nil, makes it HTTPS.
func Listen(addr string, token func() string, reg *prometheus.Registry, checks Checks, console http.Handler, certs *TLS, log zerolog.Logger) (*Server, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, err
	}
	if token() == "" && !LoopbackAddr(addr) {
		return nil, ErrTokenRequired
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if certs != nil {
		ln = tls.NewListener(ln, certs.config())
	}
	s := &Server{ln: ln, tls: certs, log: log.With().Str("component", "admin").Logger()}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.Handle("GET /healthz", handler(func(w http.ResponseWriter, r *http.Request) error {
		_, err := w.Write([]byte("ok\n"))
		return err
	}))
	mux.Handle("GET /readyz", handler(func(w http.ResponseWriter, r *http.Request) error {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		if err := checks.Ready(ctx); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return nil
		}
		_, err := w.Write([]byte("ready\n"))
		return err
	}))
	mux.Handle("GET /status", handler(func(w http.ResponseWriter, r *http.Request) error {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		st, err := checks.Status(ctx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return nil
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}))
	var h http.Handler = requireToken(token, mux)
	if console != nil {
		probes := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/metrics", "/healthz", "/readyz", "/status":
				probes.ServeHTTP(w, r)
			default:
				console.ServeHTTP(w, r)
			}
		})
	}
	s.srv = &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute}
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// TLS is the server's certificate, nil when it speaks plain HTTP.
func (s *Server) TLS() *TLS { return s.tls }

// Serve serves until Shutdown.
func (s *Server) Serve() {
	if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		s.log.Error().Err(err).Msg("admin listener failed")
	}
}

// Shutdown stops the server.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// handler adapts a handler that returns an error.
type handler func(w http.ResponseWriter, r *http.Request) error

func (h handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := h(w, r); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// requireToken asks for the current token, when there is one, on every
// path but /healthz.
func requireToken(token func() string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := token()
		if t != "" && r.URL.Path != "/healthz" && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+t)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="postbox"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// LoopbackAddr reports whether a listen address (host:port) is on
// loopback: localhost, 127.0.0.0/8 or ::1.
func LoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && loopback(host)
}

func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
