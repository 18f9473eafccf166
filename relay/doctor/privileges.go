package doctor

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/internal/wal"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// roleChecks are the connected role's (postbox's) privileges: the schema's
// version against this binary, and each privilege postbox run uses that
// the role lacks, with its GRANT. A missing privilege is a finding, never
// an error of the doctor's own.
func roleChecks(ctx context.Context, q telemetry.Querier, cfg *config.Config, role string) []Check {
	var out []Check
	var schemaExists, mayCreate, mayMigrate bool
	var readable *bool // nil: no schema_migrations
	err := q.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'postbox'),
		       has_database_privilege(current_database(), 'CREATE'),
		       coalesce((SELECT pg_has_role(current_user, nspowner, 'USAGE') OR has_schema_privilege(oid, 'CREATE')
		                 FROM pg_namespace WHERE nspname = 'postbox'), true)
		         AND (has_database_privilege(current_database(), 'CREATE') OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)),
		       (SELECT has_table_privilege(c.oid, 'SELECT') AND has_schema_privilege(c.relnamespace, 'USAGE')
		        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		        WHERE n.nspname = 'postbox' AND c.relname = 'schema_migrations')`).
		Scan(&schemaExists, &mayCreate, &mayMigrate, &readable)
	var version *int
	if err == nil && readable != nil && *readable {
		var v int
		err = q.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM postbox.schema_migrations`).Scan(&v)
		version = &v
	}
	if err != nil {
		return []Check{{Name: "schema", Severity: Warn, Detail: "unreadable: " + err.Error()}}
	}
	want := len(store.Migrations())
	c := Check{Name: "schema", Severity: OK}
	switch {
	case schemaExists && cfg.Migrate && !mayMigrate:
		// Migrate's statements take CREATE on the database and the
		// schema even where they find everything made.
		c.Severity, c.Detail = Error, fmt.Sprintf("migrate is on, and role %s may not change schema postbox: postbox run would fail at start", role)
		c.Fix = "migrate: false in the configuration (or postbox run --no-migrate), and postbox migrate as the schema's owner"
	case !schemaExists && cfg.Migrate && !mayCreate:
		c.Severity, c.Detail = Error, fmt.Sprintf("schema postbox does not exist, and role %s may not create it", role)
		c.Fix = "postbox migrate as the owner role (docs/operations.md, \"Roles and grants\"), then postbox run --no-migrate"
	case !schemaExists && cfg.Migrate:
		c.Detail = "does not exist yet: postbox run (or postbox migrate) creates it"
	case (!schemaExists || readable == nil) && !cfg.Migrate:
		c.Severity, c.Detail = Error, "schema postbox is not migrated, and migrate is off"
		c.Fix = "postbox migrate as the schema's owner role"
	case version == nil:
		c.Severity, c.Detail = Warn, "version unreadable by postbox's role (see privileges)"
	case *version < want && !cfg.Migrate:
		c.Severity, c.Detail = Error, fmt.Sprintf("at version %d, this postbox needs %d, and migrate is off", *version, want)
		c.Fix = "postbox migrate as the schema's owner role"
	case *version < want:
		c.Detail = fmt.Sprintf("at version %d: postbox run migrates it to %d", *version, want)
	case *version > want:
		c.Severity, c.Detail = Error, fmt.Sprintf("at version %d, newer than this postbox knows (%d)", *version, want)
		c.Fix = "run the newer postbox"
	default:
		c.Detail = fmt.Sprintf("at version %d", *version)
	}
	out = append(out, c)

	missing, err := store.MissingPrivileges(ctx, q, cfg.Table)
	if err != nil {
		return append(out, Check{Name: "privileges", Severity: Warn, Detail: "unreadable: " + err.Error()})
	}
	for _, m := range missing {
		out = append(out, Check{Name: "privileges", Severity: Error,
			Detail: fmt.Sprintf("role %s lacks %s, which %s needs", role, m.What, m.Why), Fix: m.Grant})
	}
	if len(missing) == 0 && schemaExists {
		out = append(out, Check{Name: "privileges", Severity: OK, Detail: fmt.Sprintf("role %s has what postbox run uses", role)})
	}
	return out
}

// missingPublication is the publication check where the publication does
// not exist: fine where postbox's role may create it (it owns the outbox
// table), an error naming the statement for the table's owner otherwise.
func missingPublication(ctx context.Context, q telemetry.Querier, cfg *config.Config) Check {
	c := Check{Name: "publication", Severity: OK}
	create := wal.PublicationSQL(cfg.Publication, cfg.Table)
	var owner *string
	var owns, mayCreate bool
	err := q.QueryRow(ctx, `
		SELECT pg_get_userbyid(c.relowner)::text,
		       pg_has_role(current_user, c.relowner, 'USAGE') OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user),
		       has_database_privilege(current_database(), 'CREATE')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
		cfg.Table.Schema(), cfg.Table.Name()).Scan(&owner, &owns, &mayCreate)
	switch {
	case err != nil || owner == nil:
		// No table yet: whoever creates it (postbox migrate) owns it.
		c.Detail = cfg.Publication + " does not exist yet: postbox migrate (or run) creates it (FOR TABLE " + cfg.Table.String() + ", publish = 'insert')"
	case !owns:
		c.Severity = Error
		c.Detail = fmt.Sprintf("%s does not exist, and postbox's role may not create it: CREATE PUBLICATION takes the owner of %s, which is %s",
			cfg.Publication, cfg.Table, *owner)
		c.Fix = fmt.Sprintf("as %s (in the application's migrations): %s", store.Ident(*owner), create)
	case !mayCreate:
		c.Severity = Error
		c.Detail = fmt.Sprintf("%s does not exist, and postbox's role may not create it: it lacks CREATE on the database", cfg.Publication)
		c.Fix = "as the table's owner: " + create
	default:
		c.Detail = cfg.Publication + " does not exist yet: postbox run creates it (FOR TABLE " + cfg.Table.String() + ", publish = 'insert')"
	}
	return c
}

// AppRole reports every privilege the application's role has beyond
// what writing the outbox takes (USAGE on its schema, INSERT on the
// table), each a warning with the statement that removes it: on postbox's
// tables it could pause endpoints or forge deliveries, and with
// REPLICATION read every change of the database. What it lacks of those
// two is an error. SELECT, INSERT, UPDATE and DELETE on postbox.endpoints
// are not warned of: they are the grants docs/integration.md gives an
// application whose trigger writes its endpoints, and the OK names them.
// The checks read the catalogs, for any role.
func AppRole(ctx context.Context, q telemetry.Querier, cfg *config.Config, role string) ([]Check, error) {
	name := "app_role"
	who := store.Ident(role)
	var super, repl, isPostbox, usage, insert bool
	var schemaCreate, found bool
	err := q.QueryRow(ctx, `
		SELECT true, r.rolsuper, r.rolreplication, r.rolname = current_user,
		       coalesce((SELECT has_schema_privilege(r.oid, n.oid, 'USAGE') FROM pg_namespace n WHERE n.nspname = $2), false),
		       coalesce((SELECT has_table_privilege(r.oid, c.oid, 'INSERT') FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		                 WHERE n.nspname = $2 AND c.relname = $3), false),
		       coalesce((SELECT has_schema_privilege(r.oid, n.oid, 'CREATE') AND NOT pg_has_role(r.oid, n.nspowner, 'USAGE')
		                 FROM pg_namespace n WHERE n.nspname = 'postbox'), false)
		FROM pg_roles r WHERE r.rolname = $1`, role, cfg.Table.Schema(), cfg.Table.Name()).
		Scan(&found, &super, &repl, &isPostbox, &usage, &insert, &schemaCreate)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("doctor: read role %s: %w", role, err)
	}
	if !found {
		return []Check{{Name: name, Severity: Error, Detail: fmt.Sprintf("role %s does not exist", role)}}, nil
	}
	var out []Check
	warn := func(detail, fix string) {
		out = append(out, Check{Name: name, Severity: Warn, Detail: fmt.Sprintf("role %s %s", role, detail), Fix: fix})
	}
	if isPostbox {
		warn("is postbox's own role: the application must not share the replication role",
			"give the application a role of its own with INSERT on "+cfg.Table.String()+" (docs/operations.md, \"Roles and grants\")")
	}
	if super {
		warn("is a superuser: it may do anything, to postbox's tables too", "ALTER ROLE "+who+" NOSUPERUSER")
	}
	if repl {
		warn("may replicate: through a slot it reads every change of the database", "ALTER ROLE "+who+" NOREPLICATION")
	}
	if schemaCreate {
		warn("may create objects in schema postbox", "REVOKE CREATE ON SCHEMA postbox FROM "+who)
	}
	if !usage || !insert {
		grant := "GRANT INSERT ON " + cfg.Table.String() + " TO " + who
		if !usage {
			grant = "GRANT USAGE ON SCHEMA " + store.Ident(cfg.Table.Schema()) + " TO " + who + "; " + grant
		}
		out = append(out, Check{Name: name, Severity: Error,
			Detail: fmt.Sprintf("role %s may not insert into %s: the application's events fail", role, cfg.Table), Fix: grant})
	}
	if super {
		return out, nil // every other privilege follows from it
	}

	// What the role owns in the schema, and the publication: an owner
	// holds every privilege on it, which no REVOKE takes away.
	rows, err := q.Query(ctx, `
		WITH r AS (SELECT oid FROM pg_roles WHERE rolname = $1)
		SELECT kind, obj, pg_get_userbyid(n.nspowner)::text FROM r, pg_namespace n, LATERAL (
		  SELECT CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END, n.nspname || '.' || c.relname
		  FROM pg_class c WHERE c.relnamespace = n.oid AND c.relkind IN ('r', 'p', 'S', 'v', 'm') AND pg_has_role(r.oid, c.relowner, 'USAGE')
		    AND (n.nspname = 'postbox' OR c.relname = $4) -- of another schema, the outbox table alone
		  UNION ALL
		  SELECT 'FUNCTION', p.oid::regprocedure::text FROM pg_proc p
		  WHERE n.nspname = 'postbox' AND p.pronamespace = n.oid AND pg_has_role(r.oid, p.proowner, 'USAGE')
		  UNION ALL
		  SELECT 'SCHEMA', n.nspname WHERE n.nspname = 'postbox' AND pg_has_role(r.oid, n.nspowner, 'USAGE')
		  UNION ALL
		  SELECT 'PUBLICATION', p.pubname FROM pg_publication p WHERE n.nspname = 'postbox' AND p.pubname = $2 AND pg_has_role(r.oid, p.pubowner, 'USAGE')
		) o(kind, obj)
		WHERE n.nspname IN ('postbox', $3)
		ORDER BY 1, 2`, role, cfg.Publication, cfg.Table.Schema(), cfg.Table.Name())
	if err != nil {
		return nil, fmt.Errorf("doctor: read what role %s owns: %w", role, err)
	}
	type owned struct{ kind, obj, schemaOwner string }
	var owns []owned
	for rows.Next() {
		var o owned
		if err := rows.Scan(&o.kind, &o.obj, &o.schemaOwner); err != nil {
			rows.Close()
			return nil, fmt.Errorf("doctor: read what role %s owns: %w", role, err)
		}
		owns = append(owns, o)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("doctor: read what role %s owns: %w", role, err)
	}
	for _, o := range owns {
		to := "postbox_owner"
		if o.schemaOwner != role {
			to = store.Ident(o.schemaOwner)
		}
		warn(fmt.Sprintf("owns %s %s: it holds every privilege on it", strings.ToLower(o.kind), o.obj),
			fmt.Sprintf("ALTER %s %s OWNER TO %s (a role of its own for the migrations, another for the application)", o.kind, o.obj, to))
	}

	// Each privilege on the schema's tables and sequences, and on the
	// outbox table, the INSERT apart; with the grantees it comes through:
	// the role itself, PUBLIC, or a role it is a member of.
	rows, err = q.Query(ctx, `
		WITH r AS (SELECT oid FROM pg_roles WHERE rolname = $1),
		objs AS (
		  SELECT c.oid, n.nspname || '.' || c.relname AS obj, c.relkind = 'S' AS seq,
		         coalesce(c.relacl, acldefault(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END::"char", c.relowner)) AS acl,
		         n.nspname = $2 AND c.relname = $3 AS is_outbox
		  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, r
		  WHERE (n.nspname = 'postbox' OR (n.nspname = $2 AND c.relname = $3)) AND c.relkind IN ('r', 'p', 'S', 'v', 'm')
		    AND NOT pg_has_role(r.oid, c.relowner, 'USAGE')
		)
		SELECT o.obj, o.seq, p.p, o.obj = 'postbox.endpoints' AND p.p IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE'),
		       ARRAY(SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee)::text END
		             FROM (SELECT * FROM aclexplode(o.acl)
		                   UNION ALL SELECT x.* FROM pg_attribute at, aclexplode(at.attacl) x WHERE at.attrelid = o.oid AND at.attacl IS NOT NULL) a
		             WHERE a.privilege_type = p.p AND (a.grantee = 0 OR pg_has_role(r.oid, a.grantee, 'USAGE'))
		             ORDER BY 1)
		FROM objs o, r, unnest(CASE WHEN o.seq THEN ARRAY['USAGE', 'SELECT', 'UPDATE']
		                            ELSE ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER'] END) WITH ORDINALITY p(p, i)
		WHERE NOT (o.is_outbox AND p.p = 'INSERT')
		  AND CASE WHEN o.seq THEN has_sequence_privilege(r.oid, o.oid, p.p)
		           WHEN p.p IN ('SELECT', 'INSERT', 'UPDATE', 'REFERENCES') THEN has_any_column_privilege(r.oid, o.oid, p.p)
		           ELSE has_table_privilege(r.oid, o.oid, p.p) END
		ORDER BY o.obj, p.i`, role, cfg.Table.Schema(), cfg.Table.Name())
	if err != nil {
		return nil, fmt.Errorf("doctor: read role %s's privileges: %w", role, err)
	}
	type grant struct {
		seq      bool
		privs    []string
		grantees map[string][]string // grantee → privileges through it
	}
	byObj := map[string]*grant{}
	var objs, endpoints []string
	for rows.Next() {
		var obj, priv string
		var seq, documented bool
		var grantees []string
		if err := rows.Scan(&obj, &seq, &priv, &documented, &grantees); err != nil {
			rows.Close()
			return nil, fmt.Errorf("doctor: read role %s's privileges: %w", role, err)
		}
		if documented {
			// The grants of the pattern docs/integration.md gives ("Partners
			// kept in the application's table"): a trigger of the
			// application's writes its endpoints. Intended, so not warned of;
			// anything beyond them is.
			endpoints = append(endpoints, priv)
			continue
		}
		g := byObj[obj]
		if g == nil {
			g = &grant{seq: seq, grantees: map[string][]string{}}
			byObj[obj] = g
			objs = append(objs, obj)
		}
		g.privs = append(g.privs, priv)
		if len(grantees) == 0 {
			grantees = []string{role}
		}
		for _, ge := range grantees {
			g.grantees[ge] = append(g.grantees[ge], priv)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("doctor: read role %s's privileges: %w", role, err)
	}
	for _, obj := range objs {
		g := byObj[obj]
		kind := "TABLE "
		if g.seq {
			kind = "SEQUENCE "
		}
		var fixes []string
		names := make([]string, 0, len(g.grantees))
		for ge := range g.grantees {
			names = append(names, ge)
		}
		sort.Strings(names)
		for _, ge := range names {
			privs := strings.Join(g.grantees[ge], ", ")
			switch ge {
			case role:
				fixes = append(fixes, "REVOKE "+privs+" ON "+kind+obj+" FROM "+who)
			case "PUBLIC":
				fixes = append(fixes, "REVOKE "+privs+" ON "+kind+obj+" FROM PUBLIC")
			default:
				fixes = append(fixes, "REVOKE "+store.Ident(ge)+" FROM "+who+" (it has "+privs+"), or REVOKE "+privs+" ON "+kind+obj+" FROM "+store.Ident(ge))
			}
		}
		warn(fmt.Sprintf("has %s on %s", strings.Join(g.privs, ", "), obj), strings.Join(fixes, "; "))
	}
	switch {
	case len(endpoints) > 0:
		more := ", and nothing more of postbox's"
		if len(out) > 0 {
			more = ""
		}
		out = append(out, Check{Name: name, Severity: OK,
			Detail: fmt.Sprintf("role %s may insert into %s and has %s on postbox.endpoints, the grants of an application that writes its endpoints (docs/integration.md)%s",
				role, cfg.Table, strings.Join(endpoints, ", "), more)})
	case len(out) == 0:
		out = append(out, Check{Name: name, Severity: OK,
			Detail: fmt.Sprintf("role %s may insert into %s, and nothing more of postbox's", role, cfg.Table)})
	}
	return out, nil
}
