package execute

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/config"
)

// A row's headers sit beside the endpoint's, never over them, and are
// bounded in number, size and name.
func TestRowHeaders(t *testing.T) {
	ep := config.Endpoint{Headers: map[string]string{"Authorization": "Bearer partner", "Content-Type": "application/json"}}
	row := map[string]string{
		"authorization":         "Bearer attacker",
		"content-type":          "text/plain",
		"X-Tenant":              "t-9",
		"Bad Name":              "x",
		"X_Under":               "x",
		"X-Nul":                 "a\x00b",
		"X-Newline":             "a\r\nb",
		"Webhook-Signature":     "v1,forged",
		"Host":                  "evil.example",
		strings.Repeat("X", 65): "too long a name",
	}
	b, err := json.Marshal(row)
	require.NoError(t, err)
	h := requestHeader(ep, b)
	require.Equal(t, "Bearer partner", h.Get("Authorization"))
	require.Equal(t, "application/json", h.Get("Content-Type"))
	require.Equal(t, "t-9", h.Get("X-Tenant"))
	require.Len(t, h, 3, "%v", h)

	many := map[string]string{}
	for i := range 40 {
		many[fmt.Sprintf("X-H%02d", i)] = "v"
	}
	b, _ = json.Marshal(many)
	require.Len(t, requestHeader(config.Endpoint{}, b), MaxRowHeaders)

	big := map[string]string{"X-A": strings.Repeat("a", 5000), "X-B": strings.Repeat("b", 5000)}
	b, _ = json.Marshal(big)
	h = requestHeader(config.Endpoint{}, b)
	require.Len(t, h, 1, "8 KiB in all")
	require.NotEmpty(t, h.Get("X-A"))
}
