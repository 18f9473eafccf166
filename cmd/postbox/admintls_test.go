package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/pgtest"
)

// selfSigned writes a self-signed certificate for 127.0.0.1 named cn, and
// its key, to certFile and keyFile; it returns the certificate.
func selfSigned(t *testing.T, cn, certFile, keyFile string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return c
}

// TestAdminTLSReloadsOnSIGHUP: with admin_tls_cert and admin_tls_key the
// admin listener speaks HTTPS only, the console's session cookie is
// Secure, and SIGHUP swaps in a rewritten certificate for new
// connections; a pair that does not load leaves the one in use.
func TestAdminTLSReloadsOnSIGHUP(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key")
	first := selfSigned(t, "postbox-first", certFile, keyFile)
	const token = "admin-token-0123456789"
	cfg := writeConfig(t, pgtest.NewDatabase(t), "admin_token: "+token+"\nadmin_tls_cert: "+certFile+"\nadmin_tls_key: "+keyFile+"\n")
	p := startPostbox(t, nil, "run", "--config", cfg)
	p.waitLog(t, time.Minute, "admin listener")
	m := regexp.MustCompile(`"addr":"(127\.0\.0\.1:\d+)"[^\n]*admin listener`).FindStringSubmatch(p.out.String())
	require.NotNil(t, m, p.out.String())
	addr := m[1]

	roots := x509.NewCertPool()
	roots.AddCert(first)
	client := func() *http.Client {
		return &http.Client{
			Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: true},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			Timeout:       10 * time.Second,
		}
	}
	servedBy := func() string {
		t.Helper()
		resp, err := client().Get("https://" + addr + "/healthz")
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return resp.TLS.PeerCertificates[0].Subject.CommonName
	}
	require.Equal(t, "postbox-first", servedBy())

	plain, err := http.Get("http://" + addr + "/healthz")
	require.NoError(t, err)
	body, _ := io.ReadAll(plain.Body)
	plain.Body.Close()
	require.Equal(t, http.StatusBadRequest, plain.StatusCode, "plain HTTP is not served")
	require.NotContains(t, string(body), "ok")

	req, err := http.NewRequest(http.MethodPost, "https://"+addr+"/login", strings.NewReader(url.Values{"token": {token}, "next": {"/"}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://"+addr)
	resp, err := client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Len(t, resp.Cookies(), 1)
	require.True(t, resp.Cookies()[0].Secure, "the session cookie is Secure under TLS")

	// A rotation rewrites the files in place, then signals.
	second := selfSigned(t, "postbox-second", certFile, keyFile)
	roots.AddCert(second)
	p.signal(t, syscall.SIGHUP)
	p.waitLog(t, 30*time.Second, "configuration reloaded")
	require.Equal(t, "postbox-second", servedBy())

	require.NoError(t, os.WriteFile(keyFile, []byte("not a key\n"), 0o600))
	p.signal(t, syscall.SIGHUP)
	p.waitLog(t, 30*time.Second, "configuration not reloaded")
	require.Contains(t, p.out.String(), "admin_tls_cert")
	require.Equal(t, "postbox-second", servedBy(), "the certificate in use stays")
}
