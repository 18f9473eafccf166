package endpoints

import (
	"fmt"

	"github.com/jackc/pgx/v5"
)

// CollectRows reads rows of a query of postbox.endpoints made with
// pgx.QueryResultFormats{pgx.TextFormatCode}: each column's text output,
// as the stream sends it, so that Parse reads both alike. It closes rows.
func CollectRows(rows pgx.Rows) ([]Row, error) {
	defer rows.Close()
	var out []Row
	for rows.Next() {
		row := Row{}
		for i, f := range rows.FieldDescriptions() {
			if v := rows.RawValues()[i]; v != nil {
				s := string(v)
				row[f.Name] = &s
			}
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read postbox.endpoints: %w", err)
	}
	return out, nil
}
