package telemetry

import (
	"fmt"
	"strings"
	"unicode"
)

// Printable drops control characters, so names and messages from the
// database cannot rewrite the operator's terminal.
func Printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return -1
		}
		return r
	}, s)
}

// ShellQuote quotes s for a command the operator may paste: as is when it
// is plain, in single quotes otherwise, and with ANSI-C quoting ($'…')
// when it holds control characters.
func ShellQuote(s string) string {
	plain := s != ""
	control := false
	for _, r := range s {
		switch {
		case unicode.IsControl(r):
			control, plain = true, false
		case !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-.,:/@%+=", r)):
			plain = false
		}
	}
	switch {
	case plain:
		return s
	case !control:
		return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
	}
	var b strings.Builder
	b.WriteString("$'")
	for _, r := range s {
		switch {
		case r == '\'' || r == '\\':
			b.WriteString(`\` + string(r))
		case unicode.IsControl(r) && r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		case unicode.IsControl(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteString("'")
	return b.String()
}
