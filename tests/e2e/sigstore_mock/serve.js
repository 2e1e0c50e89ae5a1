// Mock Fulcio, Rekor and timestamp authority (@sigstore/mock) on one loopback HTTP port, for the
// keyless rehearsal (tests/e2e/test_keyless_e2e.py). Prints one JSON line on stdout once it
// listens: {"url": "http://127.0.0.1:PORT"}; writes into the folder argv[2] the trusted root
// made from this run's fresh keys (trusted_root.json, for `builder verify --trusted-root`) and
// sigstore's client trust config naming these services (trust_config.json, for `builder attest
// --sigstore-config`; no TSA in it: the mock's takes JSON requests, not RFC 3161 ones). Fulcio takes the certificate's subject from the token's `mock_san` claim
// (real Fulcio builds it from GitHub's `job_workflow_ref`) and its issuer extension from `iss`.
// MOCK_CLOCK (ISO time) backdates the CA, to rehearse a certificate outside its validity.
"use strict";
const crypto = require("crypto");
const fs = require("fs");
const http = require("http");
const mock = require("@sigstore/mock");

const ec = () => crypto.generateKeyPairSync("ec", { namedCurve: "P-256" });
const der = (key) => key.export({ format: "der", type: "spki" }).toString("base64");
const b64 = (view) => Buffer.from(view.buffer, view.byteOffset, view.byteLength).toString("base64");

function trustedRoot(url, { ca, tlog, ctlog, tsa }, start) {
  const validFor = { start };
  const logKey = (publicKey, keyId) => ({
    baseUrl: url, hashAlgorithm: "SHA2_256", logId: { keyId },
    publicKey: { rawBytes: publicKey.toString("base64"),
                 keyDetails: "PKIX_ECDSA_P256_SHA_256", validFor } });
  const authority = (certificates) => ({
    subject: { organization: "sigstore.mock", commonName: "sigstore" }, uri: url,
    certChain: { certificates: certificates.map((c) => ({ rawBytes: b64(c) })) }, validFor });
  return {
    mediaType: "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
    tlogs: [logKey(tlog.publicKey,
                   crypto.createHash("sha256").update(tlog.publicKey).digest("base64"))],
    certificateAuthorities: [authority([ca.rootCertificate])],
    ctlogs: [logKey(ctlog.publicKey, b64(ctlog.logID))],
    timestampAuthorities: [authority([tsa.intCertificate, tsa.rootCertificate])],
  };
}

// sigstore-python sends Fulcio's CSR request with the token as a bearer header and the CSR
// base64-encoded PEM; the mock reads both from the body, as @sigstore/sign sends them.
function asFulcioV2(text, headers) {
  const doc = JSON.parse(text);
  if (!("certificateSigningRequest" in doc)) return text;
  const csr = doc.certificateSigningRequest;
  const bearer = (headers.authorization || "").replace(/^Bearer /, "");
  return JSON.stringify({
    credentials: doc.credentials || { oidcIdentityToken: bearer },
    certificateSigningRequest: csr.startsWith("-----") ? csr
      : Buffer.from(csr, "base64").toString() });
}

// Rekor stores a DSSE entry as hashes and signatures, not as proposed (the envelope and its
// verifiers), and its verifier PEM re-encoded (64 columns: sigstore-js wraps at another width);
// the mock logs what it is sent, so the proposal is turned into the stored form here.
function asStoredDsse(text) {
  const doc = JSON.parse(text);
  const proposed = doc.kind === "dsse" && doc.spec && doc.spec.proposedContent;
  if (!proposed) return text;
  const envelope = JSON.parse(proposed.envelope);
  const sha256 = (data) => crypto.createHash("sha256").update(data).digest("hex");
  const pem = new crypto.X509Certificate(Buffer.from(proposed.verifiers[0], "base64")).toString();
  return JSON.stringify({ kind: "dsse", apiVersion: doc.apiVersion, spec: {
    envelopeHash: { algorithm: "sha256", value: sha256(proposed.envelope) },
    payloadHash: { algorithm: "sha256", value: sha256(Buffer.from(envelope.payload, "base64")) },
    signatures: envelope.signatures.map((x) => ({ signature: x.sig,
                                                  verifier: Buffer.from(pem).toString("base64") })) } });
}

function trustConfig(url, root) {
  const service = { url, majorApiVersion: 1, validFor: { start: "2020-01-01T00:00:00Z" },
                    operator: "sigstore.mock" };
  return {
    mediaType: "application/vnd.dev.sigstore.clienttrustconfig.v0.1+json", trustedRoot: root,
    signingConfig: { mediaType: "application/vnd.dev.sigstore.signingconfig.v0.2+json",
                     caUrls: [service], oidcUrls: [], rekorTlogUrls: [service], tsaUrls: [],
                     rekorTlogConfig: { selector: "ANY" }, tsaConfig: { selector: "ANY" } } };
}

// The mock proves each entry as the only leaf of a one-leaf tree: index 0, which protobuf JSON
// omits, and sigstore-python then refuses a bundle from sigstore-js as lacking `logIndex`. Real
// logs are never that small: the entry is re-proved here as the second leaf of a two-leaf tree
// (the first a fixed stand-in), the checkpoint re-signed with the log's key.
function asSecondLeaf(text, logKey) {
  const sha256 = (...parts) => crypto.createHash("sha256").update(Buffer.concat(parts)).digest();
  const doc = JSON.parse(text);
  for (const entry of Object.values(doc)) {
    const proof = entry.verification.inclusionProof;
    const first = sha256(Buffer.from([0]), Buffer.from("a stand-in first leaf"));
    const leaf = sha256(Buffer.from([0]), Buffer.from(entry.body, "base64"));
    const root = sha256(Buffer.from([1]), first, leaf);
    const [origin, , , stamp] = proof.checkpoint.split("\n");
    const note = [origin, "2", root.toString("base64"), stamp, ""].join("\n");
    const logID = sha256(logKey.publicKey.export({ format: "der", type: "spki" }));
    const sig = Buffer.concat([logID.subarray(0, 4),
                               crypto.sign("sha256", Buffer.from(note), logKey.privateKey)]);
    Object.assign(proof, {
      logIndex: 1, treeSize: 2, rootHash: root.toString("hex"), hashes: [first.toString("hex")],
      checkpoint: [note, `\u2014 ${origin.split(" ")[0]} ${sig.toString("base64")}`, ""].join("\n") });
  }
  return JSON.stringify(doc);
}

async function main(folder) {
  const clock = process.env.MOCK_CLOCK ? new Date(process.env.MOCK_CLOCK) : undefined;
  const server = http.createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${server.address().port}`;
  const ctlog = await mock.initializeCTLog(ec());
  const logKey = ec();
  const parts = { ctlog, ca: await mock.initializeCA(ec(), ctlog, clock),
                  tlog: await mock.initializeTLog(url, logKey), tsa: await mock.initializeTSA(ec()) };
  const handlers = [mock.fulcioHandler(parts.ca, { subjectClaim: "mock_san" }),
                    mock.rekorHandler(parts.tlog), mock.tsaHandler(parts.tsa)];
  const routes = new Map(handlers.map((h) => [h.path, h.fn]));
  server.on("request", (req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", async () => {
      const fn = req.method === "POST" && routes.get(req.url.split("?")[0]);
      if (!fn) { res.writeHead(404).end(); return; }
      const body = Buffer.concat(chunks);
      const isJson = (req.headers["content-type"] || "").includes("json");
      const out = await fn(isJson ? asStoredDsse(asFulcioV2(body.toString(), req.headers)) : body);
      if (req.url.startsWith("/api/v1/log/entries") && out.statusCode < 300) {
        out.response = asSecondLeaf(out.response, logKey);
      }
      res.writeHead(out.statusCode, { "Content-Type": out.contentType || "text/plain" });
      res.end(typeof out.response === "string" ? out.response : Buffer.from(
        out.response.buffer, out.response.byteOffset, out.response.byteLength));
    });
  });
  const start = new Date((clock || new Date()).getTime() - 86400e3).toISOString();
  const root = trustedRoot(url, parts, start);
  fs.writeFileSync(`${folder}/trusted_root.json`, JSON.stringify(root, null, 1));
  fs.writeFileSync(`${folder}/trust_config.json`, JSON.stringify(trustConfig(url, root), null, 1));
  process.stdout.write(JSON.stringify({ url }) + "\n");
}

main(process.argv[2]).catch((e) => { console.error(e); process.exit(1); });
