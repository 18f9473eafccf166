package endpointsync

// HeldResolutions is how many table endpoints were resolved to know
// whether they are held.
func HeldResolutions() int64 { return heldResolutions.Load() }

// RowsRead is how many rows of endpoint_state Refresh read.
func RowsRead() int64 { return rowsRead.Load() }
