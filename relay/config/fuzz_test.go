package config

import (
	"errors"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
)

// inputSecret matches what looks like a signing secret in the input.
var inputSecret = regexp.MustCompile(`whsec_[A-Za-z0-9+/=]{4,}`)

// parseInMemory is Parse with each secrets file's content its own path,
// so a fuzzed configuration never reads the disk (a path such as
// /dev/zero would never end).
func parseInMemory(data []byte) (*Config, error) {
	f := Default()
	if err := f.decode(data); err != nil {
		return nil, err
	}
	return f.resolve(func(key, path string) ([]outbox.Secret, error) {
		return parseSecretsFile(key, path, []byte(path))
	})
}

// FuzzParse parses fuzzed YAML as Parse does. Every error is a *Error
// with a message that repeats no secret-looking value of the input; a
// configuration that resolves also validates.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := parseInMemory(data)
		if err != nil {
			var ce *Error
			require.True(t, errors.As(err, &ce), "%T %v is a *config.Error", err, err)
			require.NotEmpty(t, ce.Msg, "%v", err)
			for _, s := range inputSecret.FindAllString(string(data), -1) {
				require.NotContains(t, err.Error(), s, "the error repeats a secret of the input")
			}
			return
		}
		require.NotNil(t, cfg)
		require.NoError(t, cfg.File.Validate(), "what resolves also validates")
	})
}
