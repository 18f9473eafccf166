// A partner's receiver of postbox deliveries, verified with the
// standardwebhooks package (npm). POST deliveries are signed over their
// body; GET postbacks over the request target as sent, query included.
//
//   WEBHOOK_SECRET=whsec_... PORT=8080 node server.js
//
// Each request gets 204 when its signature verifies and 400 when it does
// not; a line on standard output says which ("verified ID" or "rejected").
// A redelivery of an id already seen is acknowledged and not processed
// twice.
"use strict";

const http = require("node:http");
const { Webhook } = require("standardwebhooks");

const wh = new Webhook(process.env.WEBHOOK_SECRET);
const seen = new Set(); // use a table with a unique key in production

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const body = Buffer.concat(chunks);
    // What was signed: the raw body of a POST, the request target of a
    // request without one (a GET postback). req.url is the target as sent.
    const signed = req.method === "GET" ? req.url : body;
    try {
      wh.verify(signed, req.headers, { jsonParse: false });
    } catch (err) {
      console.log(`rejected ${req.method} ${req.url.split("?")[0]}: ${err.message}`);
      res.writeHead(400).end();
      return;
    }
    const id = req.headers["webhook-id"];
    if (!seen.has(id)) {
      seen.add(id);
      // Process the event here: JSON.parse(body) for a POST, or
      // new URL(req.url, "http://x").searchParams for a GET postback.
    }
    console.log(`verified ${id}`);
    res.writeHead(204).end();
  });
});

server.listen(Number(process.env.PORT || 8080), "127.0.0.1", () => {
  console.log(`listening on ${server.address().port}`);
});
