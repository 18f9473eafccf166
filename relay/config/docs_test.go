package config_test

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/postbox-relay/postbox/relay/config"
)

// TestEveryConfigurationKeyIsDocumented: docs/configuration.md has one
// row for each key of the configuration, global and per endpoint, and no
// row for a key that does not exist.
func TestEveryConfigurationKeyIsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/configuration.md")
	require.NoError(t, err)
	global, endpoint, ok := strings.Cut(string(doc), "\n## Endpoint keys")
	require.True(t, ok, "the page has an Endpoint keys section")

	var wantGlobal, wantEndpoint []string
	// defaults and endpoints hold endpoint keys, documented once.
	wantGlobal = yamlKeys(reflect.TypeFor[config.File](), "", map[string]bool{"defaults": true, "endpoints": true})
	wantEndpoint = yamlKeys(reflect.TypeFor[config.EndpointConfig](), "", nil)
	require.Equal(t, wantGlobal, documented(global), "global keys in docs/configuration.md")
	require.Equal(t, wantEndpoint, documented(endpoint), "endpoint keys in docs/configuration.md")
}

var unmarshaler = reflect.TypeFor[yaml.Unmarshaler]()

// yamlKeys are the dotted paths of the keys of struct type t that take a
// value, sorted: a struct field gives the keys inside it, unless it is
// one of leaves (or parses its own value).
func yamlKeys(t reflect.Type, prefix string, leaves map[string]bool) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		key := prefix + name
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && !leaves[key] && !reflect.PointerTo(ft).Implements(unmarshaler) {
			out = append(out, yamlKeys(ft, key+".", nil)...)
			continue
		}
		out = append(out, key)
	}
	sort.Strings(out)
	return out
}

var rowKey = regexp.MustCompile("(?m)^\\| `([a-z0-9_.]+)` \\|")

// documented are the keys of the table rows in section, sorted.
func documented(section string) []string {
	var out []string
	for _, m := range rowKey.FindAllStringSubmatch(section, -1) {
		out = append(out, m[1])
	}
	sort.Strings(out)
	return out
}

// TestDocsYAMLSnippetsParse: every ```yaml block of the README and docs/
// is a configuration postbox accepts (unknown keys, bad durations and
// templates are refused as at start).
func TestDocsYAMLSnippetsParse(t *testing.T) {
	t.Parallel()
	paths, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	paths = append(paths, "../../README.md")
	found := 0
	for _, p := range paths {
		doc, err := os.ReadFile(p)
		require.NoError(t, err)
		for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(doc), -1) {
			_, err := config.Parse([]byte(m[1]))
			require.NoError(t, err, "%s:\n%s", p, m[1])
			found++
		}
	}
	require.Positive(t, found, "the docs' YAML was found")
}
