// How many pages one server's signaling holds at once: every page of a swarm, its dashboard and each worker (a tab or
// a process), holds one of these places while it is in the swarm, so it also bounds what a job can ask for.

/** pages registered at once: a lab's swarm, not peer's default 5,000 */
export const MAX_SIGNALING_CLIENTS = 512;

/** the workers one swarm can ever have: every place but its dashboard's */
export const MAX_SWARM_WORKERS = MAX_SIGNALING_CLIENTS - 1;
