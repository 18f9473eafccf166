package store

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// EmitGrants is who may write a logical decoding message, and so, with
// outbox_messages on, an event that postbox signs and sends:
// pg_logical_emit_message is executable by PUBLIC unless revoked.
type EmitGrants struct {
	// Signatures are the function's signatures on this server, as
	// regprocedure prints them (PostgreSQL 17 added one with flush).
	Signatures []string
	// Offenders are the grantees of EXECUTE on a signature that are not
	// superusers and not allowed: "PUBLIC", or a role's name.
	Offenders []string
	// Fix are the statements that leave only the allowed roles (and their
	// members, and superusers) able to emit: one REVOKE, and one GRANT per
	// allowed role lacking it, per signature.
	Fix []string
}

// emitGrantsSQL lists each signature of pg_logical_emit_message with each
// grantee of EXECUTE on it (PUBLIC is grantee 0). A function without an ACL has
// the default one, which grants PUBLIC. Superusers may whatever the
// grants say, so they are left out.
const emitGrantsSQL = `
SELECT 'pg_catalog.' || p.proname || '(' || oidvectortypes(p.proargtypes) || ')',
       coalesce(r.rolname, ''), a.grantee = 0
FROM pg_proc p
LEFT JOIN LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a ON a.privilege_type = 'EXECUTE'
LEFT JOIN pg_roles r ON r.oid = a.grantee
WHERE p.proname = 'pg_logical_emit_message' AND p.pronamespace = 'pg_catalog'::regnamespace
  AND (a.grantee IS NULL OR a.grantee = 0 OR NOT r.rolsuper)
ORDER BY 1, 2`

// LoadEmitGrants reads who may run pg_logical_emit_message beside the
// allowed roles.
func LoadEmitGrants(ctx context.Context, q Querier, allowed []string) (EmitGrants, error) {
	var g EmitGrants
	rows, err := q.Query(ctx, emitGrantsSQL)
	if err != nil {
		return g, fmt.Errorf("read the grants of pg_logical_emit_message: %w", err)
	}
	granted := map[string][]string{} // signature → its allowed grantees
	for rows.Next() {
		var sig, role string
		var public bool
		if err := rows.Scan(&sig, &role, &public); err != nil {
			rows.Close()
			return g, fmt.Errorf("read the grants of pg_logical_emit_message: %w", err)
		}
		if !slices.Contains(g.Signatures, sig) {
			g.Signatures = append(g.Signatures, sig)
		}
		switch {
		case public:
			role = "PUBLIC"
		case role == "":
			continue // no grantee: only superusers and the owner
		case slices.Contains(allowed, role):
			granted[sig] = append(granted[sig], role)
			continue
		}
		if !slices.Contains(g.Offenders, role) {
			g.Offenders = append(g.Offenders, role)
		}
		rev := "REVOKE EXECUTE ON FUNCTION " + sig + " FROM " + grantee(role)
		if !slices.Contains(g.Fix, rev) {
			g.Fix = append(g.Fix, rev)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return g, fmt.Errorf("read the grants of pg_logical_emit_message: %w", err)
	}
	for _, sig := range g.Signatures {
		for _, role := range allowed {
			if !slices.Contains(granted[sig], role) {
				g.Fix = append(g.Fix, "GRANT EXECUTE ON FUNCTION "+sig+" TO "+grantee(role))
			}
		}
	}
	if len(g.Offenders) == 0 {
		g.Fix = nil // the allowed roles may lack it: that is theirs to grant
	}
	return g, nil
}

func grantee(role string) string {
	if role == "PUBLIC" {
		return role
	}
	return pgx.Identifier{role}.Sanitize()
}

// Warning is the finding when roles beside the allowed ones may emit
// messages ("" when none may): for the doctor and the relay's start.
func (g EmitGrants) Warning() string {
	if len(g.Offenders) == 0 {
		return ""
	}
	return fmt.Sprintf("outbox_messages is on and %s may run pg_logical_emit_message (not in outbox_message_roles): "+
		"such a role can make postbox send a signed event to any endpoint", strings.Join(g.Offenders, ", "))
}
