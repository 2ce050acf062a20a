// The package's entry point: the implementation is client.js (JavaScript
// checked by tsc against its JSDoc), the declarations index.d.ts
// (test/conformance.ts checks the two agree).
export * from './client.js'
