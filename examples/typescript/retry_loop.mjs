#!/usr/bin/env node
// Retry loop: checkpoint once, then up to 3 attempts of a flaky job,
// restoring the workspace to the checkpoint between failed attempts.
//
//   CKPTD_URL=http://127.0.0.1:7070 node retry_loop.mjs /path/to/workspace
//
// Environment as for ../python/retry_loop.py: CKPTD_URL / CKPTD_SOCKET /
// CKPTD_TOKEN, CKPTD_WORKSPACE, CKPTD_ATTEMPT_FILE, FLAKY_FAILURES,
// CKPTD_AFTER_CREATE_HOOK / CKPTD_AFTER_RESTORE_HOOK.
// Exit status 0 when an attempt succeeded, 1 when all failed, 2 on errors.
import { mkdtempSync, realpathSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join, sep } from 'node:path'
import { fileURLToPath } from 'node:url'
import { Client, CkptdError } from '../../clients/typescript/src/index.js'
import { fail, reportCheckpoint, reportRestore, run, workspacePath } from './example_util.mjs'

const ATTEMPTS = 3
const FLAKY = join(dirname(fileURLToPath(import.meta.url)), 'flaky_script.mjs')

function attemptFile (workspace) {
  const path = process.env.CKPTD_ATTEMPT_FILE || join(mkdtempSync(join(tmpdir(), 'ckptd-attempts-')), 'count')
  writeFileSync(path, '0\n')
  if (realpathSync(path).startsWith(realpathSync(workspace) + sep)) {
    fail('the attempt counter must live outside the workspace, or a restore rewinds it')
  }
  return path
}

async function retry (sandbox, workspace, counter) {
  const cp = await sandbox.checkpoint.create({ name: 'before-attempt' })
  reportCheckpoint(cp)
  const env = { ...process.env, FLAKY_COUNTER: counter }
  let ok = false
  try {
    for (let attempt = 0; attempt < ATTEMPTS; attempt++) {
      const rc = run([process.execPath, FLAKY], workspace, env)
      ok = rc === 0
      console.log(`ATTEMPT ${attempt + 1} ${ok ? 'ok' : `failed exit=${rc}`}`)
      if (ok) break
      if (attempt < ATTEMPTS - 1) {
        // Back to the same starting point before trying again.
        reportRestore(await sandbox.checkpoint.restore(cp.checkpoint_id))
      }
    }
  } finally {
    await sandbox.checkpoint.delete(cp.checkpoint_id)
  }
  console.log(ok ? 'DONE ok' : `GAVE UP after ${ATTEMPTS} attempts`)
  return ok
}

const workspace = workspacePath(process.argv[2])
const counter = attemptFile(workspace)
try {
  process.exitCode = (await retry(new Client(), workspace, counter)) ? 0 : 1
} catch (e) {
  if (!(e instanceof CkptdError)) throw e
  console.error(`ckptd error: ${e.message}`)
  process.exitCode = 2
} finally {
  if (!process.env.CKPTD_ATTEMPT_FILE) rmSync(dirname(counter), { recursive: true, force: true })
}
