export * from './interfaces.js'
