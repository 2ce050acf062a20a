// @ts-check
// ckptd-client (implementation; entry point index.js): a client for ckptd's HTTP API for Node 18+, no runtime
// dependencies. Plain ESM JavaScript (node runs it as is); its types are
// index.d.ts, over api.d.ts which openapi-typescript generates from
// api/openapi.yaml (`npm run gen-types`), and `npm run check` runs
// `tsc --strict` over both and this file.
//
// Every create and restore carries an Idempotency-Key (a random UUID per
// call) and is sent again with the same key after a timeout, a dropped
// connection, a 503 or a 409 idempotency_in_progress: ckptd answers a repeat
// with the first answer, so a retry never does the work twice.
import { randomUUID } from 'node:crypto'
import http from 'node:http'

export const DEFAULT_URL = 'http://127.0.0.1:7070'

/** Base of every error: status (0 without an answer), code, detail. */
export class CkptdError extends Error {
  /**
   * @param {number} status
   * @param {string} code
   * @param {string} detail
   * @param {Record<string, unknown>} [body]
   */
  constructor (status, code, detail, body = {}) {
    super(status ? `${status} ${code}: ${detail}` : `${code}: ${detail}`)
    this.name = new.target.name
    this.status = status
    this.code = code
    this.detail = detail
    this.body = body
  }
}
/** ckptd could not be reached: the request was not sent. */
export class NotReachable extends CkptdError {}
/** The name the first examples used. */
export const ConnectionFailed = NotReachable
/** Sent, but no answer in time (or the connection broke): it may have happened. */
export class OutcomeUnknown extends CkptdError {}
/** ckptd answered with an error. */
export class ApiError extends CkptdError {}
export class BadRequest extends ApiError {}
export class Unauthorized extends ApiError {}
export class LimitReached extends ApiError {}
export class NotFound extends ApiError {}
export class MethodNotAllowed extends ApiError {}
export class Conflict extends ApiError {}
export class IdempotencyInProgress extends Conflict {}
export class IdempotencyKeyReused extends ApiError {}
export class Expired extends ApiError {}
export class PayloadTooLarge extends ApiError {}
export class UnsupportedMediaType extends ApiError {}
export class ServerError extends ApiError {}
export class Unavailable extends ApiError {}
export class InsufficientStorage extends ApiError {}
export class RegistryFailed extends ApiError {}
export class CreateFailed extends ApiError {}

/** @type {Record<string, typeof ApiError>} */
const BY_CODE = {
  bad_request: BadRequest,
  invalid_field: BadRequest,
  invalid_idempotency_key: BadRequest,
  unauthorized: Unauthorized,
  checkpoint_limit: LimitReached,
  forbidden: LimitReached,
  not_found: NotFound,
  method_not_allowed: MethodNotAllowed,
  conflict: Conflict,
  idempotency_in_progress: IdempotencyInProgress,
  idempotency_key_reused: IdempotencyKeyReused,
  checkpoint_expired: Expired,
  gone: Expired,
  body_too_large: PayloadTooLarge,
  unsupported_media_type: UnsupportedMediaType,
  internal: ServerError,
  unavailable: Unavailable,
  insufficient_storage: InsufficientStorage
}

/** @type {Record<number, typeof ApiError>} */
const BY_STATUS = {
  400: BadRequest,
  401: Unauthorized,
  403: LimitReached,
  404: NotFound,
  405: MethodNotAllowed,
  409: Conflict,
  410: Expired,
  413: PayloadTooLarge,
  415: UnsupportedMediaType,
  422: IdempotencyKeyReused,
  500: ServerError,
  502: RegistryFailed,
  503: Unavailable,
  507: InsufficientStorage
}

/**
 * The typed error for a non-2xx answer (problem+json or anything else).
 * @param {number} status
 * @param {string} text
 * @returns {ApiError}
 */
export function errorFromResponse (status, text) {
  /** @type {Record<string, any>} */
  let body = {}
  try {
    const parsed = JSON.parse(text)
    if (parsed && typeof parsed === 'object' && !Array.isArray(parsed)) body = parsed
  } catch {}
  const code = typeof body.code === 'string' ? body.code : `http_${status}`
  const detail = typeof body.detail === 'string' ? body.detail : (text.trim() || `HTTP ${status}`)
  const Cls = BY_CODE[code] || BY_STATUS[status] || ApiError
  return new Cls(status, code, detail, body)
}

/**
 * One exchange with node:http (TCP or a unix socket), on a fresh
 * connection (no keep-alive: "connected" must mean this request's). Resolves to the
 * answer; rejects with NotReachable when the connection could not be made,
 * OutcomeUnknown when it was made but no full answer came in time.
 * @param {{socketPath?: string, url: URL, method: string, path: string,
 *   headers: Record<string, string>, data?: string, timeoutMs: number, where: string}} o
 * @returns {Promise<{status: number, text: string}>}
 */
function exchange (o) {
  return new Promise((resolve, reject) => {
    let connected = false
    let timedOut = false
    const target = o.socketPath
      ? { socketPath: o.socketPath }
      : { host: o.url.hostname, port: o.url.port || 80 }
    const req = http.request({ ...target, method: o.method, path: o.path, headers: o.headers, agent: false }, (res) => {
      /** @type {Buffer[]} */
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => { clearTimeout(timer); resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8') }) })
      res.on('error', (e) => req.destroy(e))
    })
    const timer = setTimeout(() => { timedOut = true; req.destroy(new Error(`no answer within ${o.timeoutMs} ms`)) }, o.timeoutMs)
    req.on('socket', (s) => s.on('connect', () => { connected = true }))
    req.on('error', (/** @type {NodeJS.ErrnoException} */ e) => {
      clearTimeout(timer)
      if (!connected) { // nothing was sent: refused, no such socket, no route, connect timeout
        reject(new NotReachable(0, 'not_reachable', `cannot reach ckptd at ${o.where}: ${e.message}`))
      } else if (timedOut) {
        reject(new OutcomeUnknown(0, 'timeout', `no answer from ckptd at ${o.where} within ${o.timeoutMs} ms: the ${o.method} may still happen`))
      } else {
        reject(new OutcomeUnknown(0, 'connection_lost', `connection to ckptd at ${o.where} lost before the answer: ${e.message}`))
      }
    })
    req.end(o.data)
  })
}

/**
 * Whether sending again can help and cannot do the work twice.
 * @param {unknown} e
 * @param {boolean} safe
 */
function retryable (e, safe) {
  if (e instanceof NotReachable) return true
  return safe && (e instanceof OutcomeUnknown || e instanceof Unavailable || e instanceof IdempotencyInProgress)
}

/** @param {number} ms */
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

/** @param {string} id */
const seg = (id) => encodeURIComponent(id)

/** client.checkpoint: the calls an agent SDK makes. */
class Checkpoints {
  /** @param {Client} client */
  constructor (client) { this.client = client }

  /**
   * @param {import('./index.js').CreateOptions} opts
   * @returns {Promise<import('./index.js').Checkpoint>}
   */
  async create ({ name, ttl_secs: ttlSecs, labels, async: isAsync, wait, idempotencyKey, pollMs = 100 }) {
    /** @type {import('./index.js').CreateRequest} */
    const body = { name }
    if (ttlSecs != null) body.ttl_secs = ttlSecs
    if (labels != null) body.labels = labels
    if (isAsync || wait) body.async = true
    const rec = await this.client.request('POST', '/v1/checkpoints', body, idempotencyKey || randomUUID())
    return wait ? this.wait(rec.checkpoint_id, { pollMs }) : rec
  }

  /**
   * Poll until the checkpoint is no longer creating.
   * @param {string} id
   * @param {{pollMs?: number, timeoutMs?: number}} [opts]
   * @returns {Promise<import('./index.js').Checkpoint>}
   */
  async wait (id, { pollMs = 100, timeoutMs } = {}) {
    const deadline = timeoutMs == null ? Infinity : Date.now() + timeoutMs
    for (;;) {
      const rec = await this.get(id)
      if (rec.status === 'failed') throw new CreateFailed(0, rec.error?.code || 'create_failed', rec.error?.detail || 'the create failed', rec)
      if (rec.status !== 'creating') return rec
      if (Date.now() > deadline) throw new OutcomeUnknown(0, 'timeout', `checkpoint ${id} still creating`)
      await sleep(pollMs)
    }
  }

  /**
   * @param {{name?: string}} [opts]
   * @returns {Promise<import('./index.js').Checkpoint[]>}
   */
  async list ({ name } = {}) {
    const query = name != null ? '?' + new URLSearchParams({ name }) : ''
    return (await this.client.request('GET', '/v1/checkpoints' + query)).checkpoints
  }

  /** @param {string} id @returns {Promise<import('./index.js').Checkpoint>} */
  get (id) { return this.client.request('GET', `/v1/checkpoints/${seg(id)}`) }

  /** @param {string} id @returns {Promise<void>} */
  async delete (id) { await this.client.request('DELETE', `/v1/checkpoints/${seg(id)}`) }

  /**
   * @param {string} id
   * @param {import('./index.js').RestoreOptions} [opts]
   * @returns {Promise<import('./index.js').RestoreReport>}
   */
  restore (id, { force, if_expired: ifExpired, verify, idempotencyKey } = {}) {
    /** @type {import('./index.js').RestoreRequest} */
    const body = {}
    if (force) body.force = true
    if (ifExpired != null) body.if_expired = ifExpired
    if (verify) body.verify = true
    return this.client.request('POST', `/v1/checkpoints/${seg(id)}/restore`, body, idempotencyKey || randomUUID())
  }

  /**
   * Push a checkpoint to a registry as an OCI image (docs/registry.md).
   * @param {string} id
   * @param {string} ref HOST[:PORT]/REPO[:TAG]
   * @param {import('./index.js').PushOptions} [opts]
   * @returns {Promise<import('./index.js').PushResult>}
   */
  push (id, ref, { base, idempotencyKey } = {}) {
    /** @type {import('./index.js').PushRequest} */
    const body = { ref }
    if (base === false) body.base = false
    return this.client.request('POST', `/v1/checkpoints/${seg(id)}/push`, body, idempotencyKey || randomUUID())
  }

  /**
   * A new checkpoint from a registry image; its record carries pull_of.
   * @param {string} ref HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@sha256:HEX
   * @param {import('./index.js').PullOptions} [opts]
   * @returns {Promise<import('./index.js').Checkpoint>}
   */
  pull (ref, { roots, idempotencyKey } = {}) {
    /** @type {import('./index.js').PullRequest} */
    const body = { ref }
    if (roots) body.roots = roots
    return this.client.request('POST', '/v1/checkpoints/pull', body, idempotencyKey || randomUUID())
  }
}

export class Client {
  /**
   * Settings come from the options, else CKPTD_URL, CKPTD_SOCKET and
   * CKPTD_TOKEN (a socket path wins over a URL).
   * @param {import('./index.js').ClientOptions} [opts]
   */
  constructor ({ url, socketPath, token, timeoutMs = 300_000, retries = 3, backoffMs = 200 } = {}) {
    const env = process.env
    this.socketPath = socketPath || (url ? undefined : env.CKPTD_SOCKET) || undefined
    this.url = (url || env.CKPTD_URL || DEFAULT_URL).replace(/\/+$/, '')
    this.token = token ?? (env.CKPTD_TOKEN || undefined)
    this.timeoutMs = timeoutMs
    this.retries = retries
    this.backoffMs = backoffMs
    this.checkpoint = new Checkpoints(this)
  }

  /** @returns {Promise<import('./index.js').Health>} */
  health () { return this.request('GET', '/v1/health') }

  /**
   * One call with its retries; the decoded JSON answer (undefined for 204).
   * @param {string} method
   * @param {string} path
   * @param {object} [body]
   * @param {string} [idempotencyKey]
   * @returns {Promise<any>}
   */
  async request (method, path, body, idempotencyKey) {
    /** @type {Record<string, string>} */
    const headers = { Accept: 'application/json' }
    let data
    if (body !== undefined) {
      data = JSON.stringify(body)
      headers['Content-Type'] = 'application/json'
    }
    if (this.token) headers.Authorization = `Bearer ${this.token}`
    if (idempotencyKey) headers['Idempotency-Key'] = idempotencyKey
    const url = new URL(this.url)
    if (!this.socketPath && url.protocol !== 'http:') throw new TypeError(`ckptd URL must be http://HOST[:PORT]: ${this.url}`)
    const prefix = this.socketPath ? '' : url.pathname.replace(/\/+$/, '')
    const safe = method === 'GET' || idempotencyKey != null
    for (let attempt = 0; ; attempt++) {
      try {
        const { status, text } = await exchange({
          socketPath: this.socketPath,
          url,
          method,
          path: prefix + path,
          headers,
          data,
          timeoutMs: this.timeoutMs,
          where: this.socketPath || this.url
        })
        if (status < 200 || status >= 300) throw errorFromResponse(status, text)
        return text ? JSON.parse(text) : undefined
      } catch (e) {
        if (attempt >= this.retries || !retryable(e, safe)) throw e
      }
      await sleep(this.backoffMs * 2 ** attempt)
    }
  }
}
