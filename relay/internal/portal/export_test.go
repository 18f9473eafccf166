package portal

// DeliveriesSQL is the partner's list, for the plan test.
const DeliveriesSQL = deliveriesSQL
