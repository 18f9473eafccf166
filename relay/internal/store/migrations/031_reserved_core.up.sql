-- Reserved for the endpoint apply path's step (issue 52, branch core),
-- which is being written beside this branch: Migrations() allows no gap,
-- and fan-out's step is 032. DELETE THIS FILE when core's 031 merges.
SELECT 1;
