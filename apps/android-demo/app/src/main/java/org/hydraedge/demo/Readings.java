package org.hydraedge.demo;

/**
 * Where the phone's heat and battery come from: {@link Signals} on a phone (PowerManager, the battery
 * broadcast); a script where no phone is (a desktop JVM running the app's classes).
 */
interface Readings {
    Signals.Reading read();
}
