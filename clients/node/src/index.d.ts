export * from './interfaces'
