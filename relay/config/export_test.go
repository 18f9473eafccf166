package config

// Contains is jsonb's a @> b on JSON texts, for the tests that hold it
// against PostgreSQL's.
func Contains(a, b []byte) bool {
	x, err := decodeJSON(a)
	if err != nil {
		return false
	}
	y, err := decodeJSON(b)
	if err != nil {
		return false
	}
	return containsTop(x, y)
}
