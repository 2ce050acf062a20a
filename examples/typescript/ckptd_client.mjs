// A small client for ckptd's HTTP API (v1) for Node 20, no dependencies.
//
//   import { Client, NotFound } from './ckptd_client.mjs'
//   const sandbox = new Client()            // CKPTD_URL / CKPTD_SOCKET / CKPTD_TOKEN
//   const cp = await sandbox.checkpoint.create({ name: 'baseline' })
//   const result = await sandbox.checkpoint.restore(cp.checkpoint_id)
//   console.log(`Restored in ${result.restore_duration_ms}ms`, result.started_services)
//
// Plain JavaScript with JSDoc types: `node` runs it as is, and TypeScript
// (checkJs or a .d.ts-free import) still sees the types.
// TCP goes through fetch; a unix socket (CKPTD_SOCKET) through node:http.
import http from 'node:http'

const DEFAULT_URL = 'http://127.0.0.1:7070'

/**
 * @typedef {object} Checkpoint
 * @property {string} checkpoint_id
 * @property {string} name
 * @property {'creating'|'active'|'deleting'} status
 * @property {string} created_at
 * @property {string|null} expires_at
 * @property {string|null} last_used_at
 * @property {number} size_bytes
 * @property {number} duration_ms
 * @property {string} backend
 * @property {Record<string,string>} labels
 *
 * @typedef {object} RestoreResult
 * @property {boolean} ok
 * @property {string} checkpoint_id
 * @property {number} restore_duration_ms
 * @property {string[]} started_services
 * @property {string[]} stopped_services
 * @property {string[]} failed_services
 * @property {boolean} restored_from_checkpoint
 * @property {boolean} ttl_expired
 */

/** An error answer from ckptd: HTTP status, stable machine code, human detail. */
export class CkptdError extends Error {
  /**
   * @param {number} status
   * @param {string} code
   * @param {string} detail
   * @param {object} [body]
   */
  constructor (status, code, detail, body = {}) {
    super(`${status} ${code}: ${detail}`)
    this.name = new.target.name
    this.status = status
    this.code = code
    this.detail = detail
    this.body = body
  }
}
/** The daemon could not be reached at all (status 0). */
export class ConnectionFailed extends CkptdError {}
export class BadRequest extends CkptdError {}
export class Unauthorized extends CkptdError {}
export class LimitReached extends CkptdError {}
export class NotFound extends CkptdError {}
export class MethodNotAllowed extends CkptdError {}
export class Conflict extends CkptdError {}
export class Expired extends CkptdError {}
export class PayloadTooLarge extends CkptdError {}
export class UnsupportedMediaType extends CkptdError {}
export class ServerError extends CkptdError {}
export class Unavailable extends CkptdError {}
export class InsufficientStorage extends CkptdError {}

const BY_CODE = {
  bad_request: BadRequest,
  invalid_field: BadRequest,
  unauthorized: Unauthorized,
  checkpoint_limit: LimitReached,
  not_found: NotFound,
  method_not_allowed: MethodNotAllowed,
  conflict: Conflict,
  checkpoint_expired: Expired,
  gone: Expired,
  body_too_large: PayloadTooLarge,
  unsupported_media_type: UnsupportedMediaType,
  internal: ServerError,
  unavailable: Unavailable,
  insufficient_storage: InsufficientStorage
}

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
  500: ServerError,
  503: Unavailable,
  507: InsufficientStorage
}

/**
 * The typed error for a non-2xx answer (problem+json or anything else).
 * @param {number} status
 * @param {string} text
 * @returns {CkptdError}
 */
export function errorFromResponse (status, text) {
  let body = {}
  try {
    const parsed = JSON.parse(text)
    if (parsed && typeof parsed === 'object' && !Array.isArray(parsed)) body = parsed
  } catch {}
  const code = body.code || `http_${status}`
  const detail = body.detail || text.trim() || `HTTP ${status}`
  const Cls = BY_CODE[code] || BY_STATUS[status] || CkptdError
  return new Cls(status, code, detail, body)
}

/**
 * One request over a unix socket with node:http.
 * @returns {Promise<{status: number, text: string}>}
 */
function unixRequest (socketPath, method, path, headers, data, timeoutMs) {
  return new Promise((resolve, reject) => {
    const req = http.request({ socketPath, method, path, headers, timeout: timeoutMs }, (res) => {
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8') }))
      res.on('error', reject)
    })
    req.on('timeout', () => req.destroy(new Error(`no answer within ${timeoutMs} ms`)))
    req.on('error', reject)
    req.end(data)
  })
}

/** client.checkpoint: the calls an agent SDK makes. */
class Checkpoints {
  /** @param {Client} client */
  constructor (client) { this.client = client }

  /**
   * @param {{name: string, ttl_secs?: number, labels?: Record<string,string>}} opts
   * @returns {Promise<Checkpoint>}
   */
  create ({ name, ttl_secs: ttlSecs, labels }) {
    const body = { name }
    if (ttlSecs != null) body.ttl_secs = ttlSecs
    if (labels != null) body.labels = labels
    return this.client.request('POST', '/v1/checkpoints', body)
  }

  /**
   * @param {{name?: string}} [opts]
   * @returns {Promise<Checkpoint[]>}
   */
  async list ({ name } = {}) {
    const query = name != null ? '?' + new URLSearchParams({ name }) : ''
    return (await this.client.request('GET', '/v1/checkpoints' + query)).checkpoints
  }

  /** @param {string} id @returns {Promise<Checkpoint>} */
  get (id) { return this.client.request('GET', `/v1/checkpoints/${encodeURIComponent(id)}`) }

  /** @param {string} id @returns {Promise<void>} */
  async delete (id) { await this.client.request('DELETE', `/v1/checkpoints/${encodeURIComponent(id)}`) }

  /**
   * @param {string} id
   * @param {{force?: boolean, if_expired?: 'fail'|'fresh'}} [opts]
   * @returns {Promise<RestoreResult>}
   */
  restore (id, { force = false, if_expired: ifExpired } = {}) {
    const body = {}
    if (force) body.force = true
    if (ifExpired != null) body.if_expired = ifExpired
    return this.client.request('POST', `/v1/checkpoints/${encodeURIComponent(id)}/restore`, body)
  }
}

export class Client {
  /**
   * Settings come from the options, else from CKPTD_URL, CKPTD_SOCKET and
   * CKPTD_TOKEN. A socket path wins over a URL.
   * @param {{url?: string, socketPath?: string, token?: string, timeoutMs?: number}} [opts]
   */
  constructor ({ url, socketPath, token, timeoutMs = 300_000 } = {}) {
    const env = process.env
    this.socketPath = socketPath || (url ? undefined : env.CKPTD_SOCKET) || undefined
    this.url = (url || env.CKPTD_URL || DEFAULT_URL).replace(/\/+$/, '')
    this.token = token ?? (env.CKPTD_TOKEN || undefined)
    this.timeoutMs = timeoutMs
    this.checkpoint = new Checkpoints(this)
  }

  health () { return this.request('GET', '/v1/health') }

  /**
   * One call; resolves to the decoded JSON answer (undefined for 204).
   * @param {string} method
   * @param {string} path
   * @param {object} [body]
   */
  async request (method, path, body) {
    const headers = { Accept: 'application/json' }
    let data
    if (body !== undefined) {
      data = JSON.stringify(body)
      headers['Content-Type'] = 'application/json'
    }
    if (this.token) headers.Authorization = `Bearer ${this.token}`
    let status, text
    try {
      if (this.socketPath) {
        ({ status, text } = await unixRequest(this.socketPath, method, path, headers, data, this.timeoutMs))
      } else {
        const res = await fetch(this.url + path, {
          method, headers, body: data, signal: AbortSignal.timeout(this.timeoutMs)
        })
        status = res.status
        text = await res.text()
      }
    } catch (e) {
      const cause = e?.cause?.message || e?.message || String(e)
      throw new ConnectionFailed(0, 'connection_failed', `cannot reach ckptd at ${this.socketPath || this.url}: ${cause}`)
    }
    if (status < 200 || status >= 300) throw errorFromResponse(status, text)
    return text ? JSON.parse(text) : undefined
  }
}
