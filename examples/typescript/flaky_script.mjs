// A flaky job for retry_loop.mjs: it changes the workspace (the current
// directory) and fails until its attempt number passes FLAKY_FAILURES
// (default 2). Each attempt writes junk/attempt-<n>.bin, appends to notes.txt
// and, when it fails, deletes data.txt (the one that succeeds leaves it). The counter (FLAKY_COUNTER) lives outside the
// workspace so that a restore does not rewind it.
import { randomBytes } from 'node:crypto'
import { appendFileSync, existsSync, mkdirSync, readFileSync, unlinkSync, writeFileSync } from 'node:fs'

const counter = process.env.FLAKY_COUNTER
const failures = Number(process.env.FLAKY_FAILURES ?? '2')
const attempt = (Number(readFileSync(counter, 'utf8').trim()) || 0) + 1
writeFileSync(counter, `${attempt}\n`)

mkdirSync('junk', { recursive: true })
writeFileSync(`junk/attempt-${attempt}.bin`, randomBytes(4096))
appendFileSync('notes.txt', `attempt ${attempt} was here\n`)

if (attempt <= failures) {
  if (existsSync('data.txt')) unlinkSync('data.txt') // the damage a restore must undo
  console.error(`flaky: attempt ${attempt} failed (simulated)`)
  process.exit(1)
}
writeFileSync('result.txt', `succeeded on attempt ${attempt}\n`)
