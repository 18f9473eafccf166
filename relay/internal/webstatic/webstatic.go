// Package webstatic holds the stylesheet and icon the console and the
// partner portal share: one look, one file to change, served by each
// under its own prefix.
package webstatic

import "embed"

// FS holds style.css and favicon.svg at its root.
//
//go:embed style.css favicon.svg
var FS embed.FS
